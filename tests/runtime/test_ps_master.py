"""The PS and the master in one process (real transport, no training): exactly-once bookkeeping,
checkpoint/restore consistency, re-partitioning, master restart."""

import time
from pathlib import Path

import numpy as np
import pytest
from chaos_faults import flip_middle_byte

from airflow_dlrover.runtime.master import CHECKPOINT_PEER_RETRY_S, Master
from airflow_dlrover.runtime.ps import ParameterServer, initial_rows
from airflow_dlrover.runtime.spec import JobSpec
from airflow_dlrover.runtime.transport import Peer, RemoteError, Server, Unreachable

pytestmark = pytest.mark.jobs

SPEC = JobSpec(job_id="unit", samples=10 * 100, shard_size=100, batch_size=25, table_sizes=(1000, 500),
               embedding_dim=4, bottom_mlp=(8, 4), shard_timeout_s=60)


@pytest.fixture()
def cluster(tmp_path):
    """``count`` PS servers in threads and a master over them; returns (master, ps objects, peers)."""
    servers = []

    def make(count, spec=SPEC):
        ps = [ParameterServer(spec, i, count, tmp_path) for i in range(count)]
        started = [Server(p.handle, spec.key).start() for p in ps]
        servers.extend(started)
        master = Master(spec, tmp_path)
        master.set_cluster([f"{s.address[0]}:{s.address[1]}" for s in started])
        peers = [Peer(s.address, spec.key, retry_s=2) for s in started]
        return master, ps, peers

    yield make
    for server in servers:
        server.close()


def push(peers, generation, first_sample, worker, rng, samples=25, only=None):
    """One batch's push to every PS (or to PS ``only``), as a worker sends it."""
    p = len(peers)
    ids = [np.unique(rng.integers(0, size, 10)) for size in SPEC.table_sizes]
    for k in range(p) if only is None else [only]:
        mine = [i[i % p == k] for i in ids]
        grads = [np.ones((len(i), SPEC.embedding_dim), np.float32) for i in mine]
        peers[k].call("push", generation=generation, ids=mine, grads=grads, batch=first_sample, samples=samples,
                      worker=worker, dense_grad=np.ones(3, np.float32) if k == 0 else None)


def trained(master) -> bool:
    """Every shard is done: the job's finish (held-out evaluation, export) is what remains."""
    return master.status()["state"] in ("finishing", "done")


def train_shard(master, peers, worker, rng, fail_after=None):
    """What a worker does for one shard (batches of 25), with numpy gradients; returns the lease reply."""
    reply = master.next_shard(worker)
    shard, generation = reply["shard"], reply["generation"]
    peers[0].call("init_dense", generation=generation, params=np.zeros(3, np.float32))
    for batch, offset in enumerate(range(reply["start"], reply["stop"], 25)):
        if fail_after is not None and batch == fail_after:
            return reply
        push(peers, generation, offset, worker, rng, samples=min(25, reply["stop"] - offset))
    master.shard_done(worker, shard, generation)
    return reply


def test_every_sample_applied_exactly_once_and_a_lost_worker_costs_at_most_one_shard(cluster):
    master, _, peers = cluster(2)
    rng = np.random.default_rng(0)
    crashed = train_shard(master, peers, "w0", rng, fail_after=2)  # w0 dies after 2 of 4 batches
    master.node_lost("w0")
    while not trained(master):
        train_shard(master, peers, "w1", rng)
    accounting = master.accounting()
    assert (accounting["samples_trained"], accounting["samples_lost"], accounting["samples_duplicated"]) == (1000, 0, 0)
    # w1 redid the crashed shard: the 2 batches w0 had pushed were refused on every PS, and say why
    assert accounting["duplicates_refused"] == 2 * 2 * 25 and accounting["duplicates_refused_by"] == {"w0 lost": 100}
    assert master.status()["counters"]["shards_requeued"] == 1
    assert crashed["shard"] in master.done


def test_restore_rolls_model_applied_batches_and_shards_back_to_the_checkpoint(cluster):
    master, ps, peers = cluster(2)
    rng = np.random.default_rng(1)
    for _ in range(3):
        train_shard(master, peers, "w", rng)
    master.checkpoint()
    saved = {k: {name: a.copy() for name, a in p.tables[0].export().items()} for k, p in enumerate(ps)}  # views
    for _ in range(2):
        train_shard(master, peers, "w", rng)
    old_generation = master.generation
    result = master.restore()
    assert result["done"] == 3 and master.generation == old_generation + 1
    assert all(len(p.batches) == 3 * 4 for p in ps)  # the applied batches rolled back with the rows
    for k, p in enumerate(ps):
        now = p.tables[0].export()
        order_now, order_saved = np.argsort(now["ids"]), np.argsort(saved[k]["ids"])
        np.testing.assert_array_equal(now["ids"][order_now], saved[k]["ids"][order_saved])
        np.testing.assert_array_equal(now["rows"][order_now], saved[k]["rows"][order_saved])
    # A push from the old generation is refused, so stragglers cannot pollute the restored model.
    with pytest.raises(RemoteError, match="StaleGeneration"):
        push(peers, old_generation, 0, "straggler", rng)
    while not trained(master):
        train_shard(master, peers, "w", rng)
    accounting = master.accounting()
    assert (accounting["samples_trained"], accounting["samples_lost"], accounting["samples_duplicated"]) == (1000, 0, 0)


def test_a_relaunched_ps_whose_restore_never_came_is_found_and_restored_by_the_master(cluster):
    """A PS relaunched by a launcher that died before ``/restore`` serves no generation: the
    master finds it (``unserved_ps``) and restores the job onto it from the last checkpoint
    (``restore_if_unserved``, then ``restore``: what ``master.serve`` does after ``UNSERVED_PS_S``)."""
    master, ps, peers = cluster(1)
    rng = np.random.default_rng(3)
    for _ in range(2):
        train_shard(master, peers, "w", rng)
    master.checkpoint()
    train_shard(master, peers, "w", rng)
    assert master.unserved_ps() == []
    ps[0].generation, ps[0].tables, ps[0].dense, ps[0].batches = -1, ps[0]._empty_tables(), None, set()  # relaunched
    [address] = master.ps_addresses
    assert master.unserved_ps() == [address]
    assert not master.restore_if_unserved(["127.0.0.1:1"])  # not a PS of the job's set
    assert master.restore_if_unserved([address]) and master.restoring
    master.restore()
    assert master.unserved_ps() == [] and ps[0].generation == master.generation
    assert len(ps[0].batches) == 2 * 4 and master.status()["shards"]["done"] == 2  # the checkpoint's state
    while not trained(master):
        train_shard(master, peers, "w", rng)
    accounting = master.accounting()
    assert (accounting["samples_trained"], accounting["samples_lost"], accounting["samples_duplicated"]) == (1000, 0, 0)


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


def test_posted_requests_are_answered_in_order_their_error_raised_at_the_next_call_and_resent_after_a_drop():
    """``Peer.post`` sends now and reads later: the next ``call`` reads every reply due, in order,
    and raises the first error among them; a connection lost with replies unread sends those
    requests again on the next one, in order (a PS refuses a batch it applied: resending is safe;
    the lost connection's server thread may still serve what it had read, before or after)."""
    seen = []

    def handler(method, **kwargs):
        seen.append((method, kwargs.get("n")))
        if method == "fail":
            raise ValueError("no")
        return kwargs.get("n")

    server = Server(handler, b"k" * 32).start()
    try:
        peer = Peer(server.address, b"k" * 32, retry_s=5)
        assert peer.call("echo", n=0) == 0
        for n in (1, 2):
            peer.post("echo", n=n)
        assert peer.call("echo", n=3) == 3 and seen[-3:] == [("echo", 1), ("echo", 2), ("echo", 3)]
        peer.post("fail", n=4)
        peer.post("echo", n=5)
        with pytest.raises(RemoteError, match="fail .*ValueError: no"):
            peer.wait()
        assert peer.call("echo", n=6) == 6 and seen[-3:] == [("fail", 4), ("echo", 5), ("echo", 6)]
        mark = len(seen)
        peer.post("echo", n=7)
        peer._conn.sock.shutdown(2)  # the connection breaks: 7 sent and unanswered, 8 not sent
        peer.post("echo", n=8)
        assert peer.call("echo", n=9) == 9
        time.sleep(0.2)  # the old connection's thread, if it read 7, has served it
        after = seen[mark:]
        assert set(after) == {("echo", 7), ("echo", 8), ("echo", 9)} and after.count(("echo", 7)) in (1, 2)
        assert after.count(("echo", 8)) == after.count(("echo", 9)) == 1
        assert after.index(("echo", 7)) < after.index(("echo", 8)) < after.index(("echo", 9))
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
            ps.handle("push", generation=3, ids=ids, grads=grads, batch=0, samples=1, worker="w")
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
    assert all(len(p.batches) == (CHECKPOINTS_KEPT + 1) * 4 for p in ps)
    while not trained(master):
        train_shard(master, peers, "w", rng)
    accounting = master.accounting()
    assert (accounting["samples_trained"], accounting["samples_lost"], accounting["samples_duplicated"]) == (1000, 0, 0)


def counts(accounting):
    return accounting["samples_trained"], accounting["samples_lost"], accounting["samples_duplicated"]


def two_checkpoints(cluster, count=2):
    """A job with shards 0–1 in its first checkpoint and 0–3 in its second, shard 4 trained after."""
    master, ps, peers = cluster(count)
    rng = np.random.default_rng(11)
    folders = []
    for _ in range(2):
        for _ in range(2):
            train_shard(master, peers, "w", rng)
        folders.append(Path(master.checkpoint()["path"]))
    train_shard(master, peers, "w", rng)
    return master, ps, peers, rng, folders


@pytest.mark.parametrize("checksums", [True, False])
def test_a_bit_flipped_newest_checkpoint_falls_back_to_the_previous_one(cluster, checksums):
    """Each checkpoint file's SHA-256 is in its manifest and checked before a restore takes it: a
    byte flipped in the middle of the newest one's ps-0.npz (its zip directory intact) makes the
    restore take the one before. A manifest without checksums (an older writer's): the PS raises
    on the file, and the master restores every PS from the checkpoint before instead of failing
    for ever. Either way the job trains every sample once."""
    import json

    master, ps, peers, rng, folders = two_checkpoints(cluster)
    if not checksums:
        manifest = json.loads((folders[-1] / "manifest.json").read_text())
        manifest.pop("crc", None), manifest.pop("sha256", None)
        (folders[-1] / "manifest.json").write_text(json.dumps(manifest))
    flip_middle_byte(folders[-1] / "ps-0.npz")
    result = master.restore()
    assert result["checkpoint"] == master.checkpoints[0]["id"] and result["done"] == 2
    assert all(p.generation == master.generation and len(p.batches) == 8 for p in ps)
    while not trained(master):
        train_shard(master, peers, "w", rng)
    assert counts(master.accounting()) == (1000, 0, 0)


@pytest.mark.parametrize("damage", ["not JSON", "a done shard changed", "state and previous"])
def test_a_damaged_master_state_restores_from_the_newest_checkpoint_and_loses_nothing(cluster, tmp_path, damage):
    """A master whose state file does not verify restores from the newest checkpoint that does,
    under a generation above every earlier one, onto the PS of the previous state file (or of the
    next ``/cluster``): no sample lost, none applied twice."""
    master, ps, peers, rng, _ = two_checkpoints(cluster)
    leased = master.next_shard("w")  # a lease out when the state is lost
    state = tmp_path / "master_state.json"
    text = state.read_text()
    if damage == "a done shard changed":  # still JSON: only its checksum tells
        state.write_text(text.replace('"done": [0, 1, 2, 3, 4]', '"done": [0, 1, 2, 3, 6]'))
    else:
        state.write_text(text[: len(text) // 2] + "\x00" + text[len(text) // 2 + 1:])
    if damage == "state and previous":
        flip_middle_byte(tmp_path / "master_state.json.prev")
    reborn = Master(SPEC, tmp_path)
    assert reborn.restoring and reborn.next_shard("w") == {"wait": 0.2}
    if damage == "state and previous":
        assert reborn.ps_addresses == []
        reborn.set_cluster(master.ps_addresses)  # the launcher's next /cluster
    else:
        assert reborn.ps_addresses == master.ps_addresses
        reborn.restore()  # what its serve loop does while ``restoring`` is set
    assert reborn.generation > master.generation and len(reborn.done) == 4
    assert reborn.counters["state_damaged"] == 1
    with pytest.raises(RemoteError, match="StaleGeneration"):  # the old lease's holder is refused
        push(peers, leased["generation"], leased["start"], "w", rng)
    while not trained(reborn):
        train_shard(reborn, peers, "w", rng)
    assert counts(reborn.accounting()) == (1000, 0, 0)


@pytest.mark.parametrize("damage", ["not JSON", "a batch changed"])
def test_a_damaged_journal_line_is_reported_not_counted_lost_and_a_torn_tail_is_skipped(cluster, tmp_path, damage):
    """Every journal line carries its CRC-32: a damaged line in the middle is reported with its
    file and line, and the batch it held is unverified, not lost (nor another one duplicated)."""
    import re

    master, _, peers = cluster(1)
    rng = np.random.default_rng(12)
    while not trained(master):
        train_shard(master, peers, "w", rng)
    assert counts(master.accounting()) == (1000, 0, 0)
    journal = next((tmp_path / "journal").glob("*.jsonl"))
    lines = journal.read_text().split("\n")
    applies = [i for i, line in enumerate(lines) if '"e": "apply"' in line]
    middle = applies[len(applies) // 2]
    batch = int(re.search(r'"b": (\d+)', lines[middle])[1])
    if damage == "not JSON":
        lines[middle] = lines[middle].replace('"b": ', '"b"= ')
    else:  # still JSON, naming the batch after it: only its checksum tells
        lines[middle] = lines[middle].replace(f'"b": {batch},', f'"b": {batch + 25},')
    journal.write_text("\n".join(lines))
    accounting = master.accounting()
    assert (accounting["samples_lost"], accounting["samples_duplicated"]) == (0, 0)
    assert accounting["samples_unverified"] == 25
    assert accounting["journal_lines_damaged"] == [{"file": journal.name, "line": middle + 1}]
    with open(journal, "a") as f:  # the tail of a PS killed mid-line
        f.write('{"e": "apply", "t": 17')
    assert master.accounting()["journal_lines_damaged"] == [{"file": journal.name, "line": middle + 1}]


def test_a_resent_push_is_applied_once_on_every_ps(cluster):
    """A push whose reply was lost is resent (``Peer.call``): each PS applies a batch once."""
    master, ps, peers = cluster(2)
    rng = np.random.default_rng(5)
    lease = master.next_shard("w")
    peers[0].call("init_dense", generation=lease["generation"], params=np.zeros(3, np.float32))
    push(peers, lease["generation"], 0, "w", rng)
    rows = ps[1].tables[0].export()["rows"].copy()
    push(peers, lease["generation"], 0, "w", rng, only=1)  # the resend, on PS 1 only
    np.testing.assert_array_equal(ps[1].tables[0].export()["rows"], rows)
    accounting = master.accounting()
    assert accounting["duplicates_refused"] == 25 and accounting["samples_duplicated"] == 0


def test_the_accounting_counts_a_batch_applied_twice_on_any_ps_and_never_nets_a_loss_against_it(tmp_path):
    """Journals written by hand: the reconciliation trusts nothing but them."""
    import json

    from airflow_dlrover.runtime.accounting import JOURNAL_DIR, reconcile

    folder = tmp_path / JOURNAL_DIR
    folder.mkdir()

    def journal(name, events):
        (folder / name).write_text("".join(json.dumps({"t": t, **e}) + "\n" for t, e in events))

    every = [(1.0 + i, {"e": "apply", "g": 0, "b": b, "n": 25, "w": "w"}) for i, b in enumerate(range(0, 1000, 25))]
    start = [(0.0, {"e": "start", "g": 0, "ps": 0, "of": 2})]
    journal("ps0-1.jsonl", start + every)
    # PS 1 applied batch 100 twice (a PS without the dedup) and never got batch 125, in one shard
    ps1 = [(t, e) for t, e in every if e["b"] != 125] + [(99.0, {"e": "apply", "g": 0, "b": 100, "n": 25, "w": "w"})]
    journal("ps1-1.jsonl", [(0.0, {"e": "start", "g": 0, "ps": 1, "of": 2})] + ps1)
    accounting = reconcile(tmp_path, SPEC, generation=0)
    assert accounting["samples_lost"] == 25 and accounting["samples_duplicated"] == 25
    assert accounting["samples_trained"] == 1000 + 25 - 0  # hi: PS 0 holds 125, PS 1 holds 100 twice


def test_the_accounting_follows_the_model_through_checkpoints_and_a_repartition(cluster):
    """Updates after the checkpoint a restore went back to are not in the model; the restore onto a
    new PS count (through ``/cluster``) carries what the checkpoint held."""
    master, ps, peers = cluster(2)
    rng = np.random.default_rng(6)
    for _ in range(3):
        train_shard(master, peers, "w", rng)
    master.checkpoint(hold=True)
    assert master.next_shard("w") == {"wait": 0.2}  # no shard while held: a PS change follows
    one = ParameterServer(SPEC, 0, 1)
    server = Server(one.handle, SPEC.key).start()
    try:
        generation = master.generation
        master.set_cluster([f"{server.address[0]}:{server.address[1]}"])
        assert master.generation == generation + 1 and len(master.done) == 3 and len(one.batches) == 12
        peer = [Peer(server.address, SPEC.key, retry_s=2)]
        with pytest.raises(RemoteError, match="StaleGeneration"):  # a worker of the old set drops its shard
            peer[0].call("lookup", generation=generation, ids=[np.array([1]), np.array([1])], dense=True)
        while not trained(master):
            train_shard(master, peer, "w", rng)
        assert counts(master.accounting()) == (1000, 0, 0)
    finally:
        server.close()


def test_a_new_ps_set_is_never_served_empty_under_the_old_done_set(cluster):
    """``/cluster`` restores the new set in the same step: a checkpoint right after it holds the
    checkpoint's rows and done set, not empty PS with every shard done (a loss)."""
    master, ps, peers = cluster(1)
    rng = np.random.default_rng(7)
    for _ in range(2):
        train_shard(master, peers, "w", rng)
    master.checkpoint()
    for _ in range(2):
        train_shard(master, peers, "w", rng)
    fresh = ParameterServer(SPEC, 0, 1)
    server = Server(fresh.handle, SPEC.key).start()
    try:
        master.set_cluster([f"{server.address[0]}:{server.address[1]}"])  # the old PS died: a new one
        assert len(master.done) == 2 and len(fresh.batches) == 8
        master.checkpoint()  # the periodic checkpoint, at the worst moment
        master.restore()
        peer = [Peer(server.address, SPEC.key, retry_s=2)]
        while not trained(master):
            train_shard(master, peer, "w", rng)
        assert counts(master.accounting()) == (1000, 0, 0)
    finally:
        server.close()


def test_a_restarted_master_keeps_the_leases_it_granted(cluster, tmp_path):
    master, _, peers = cluster(1)
    leased = master.next_shard("w0")
    reborn = Master(SPEC, tmp_path)  # the master died after granting the lease
    assert reborn.leases[leased["shard"]].worker == "w0"
    assert reborn.next_shard("w1")["shard"] != leased["shard"]  # nobody else trains it
    assert reborn.shard_done("w0", leased["shard"], leased["generation"])["accepted"]
    assert reborn.counters["shards_requeued"] == 0


def test_a_master_that_dies_mid_restore_restores_again(cluster, tmp_path, monkeypatch):
    """The restore is written ahead: a master that died after bumping the generation but before
    every PS had it finds ``restoring`` and brings the PS to its generation."""
    from airflow_dlrover.runtime.transport import Unreachable

    master, ps, peers = cluster(2)
    rng = np.random.default_rng(8)
    train_shard(master, peers, "w", rng)
    master.checkpoint()
    calls = []

    def dies_after_the_first(self, method, **kwargs):  # PS 0 restored, then the master dies
        calls.append(method)
        if len(calls) > 1:
            raise Unreachable("master killed")
        return original(self, method, **kwargs)

    original = Peer.call
    monkeypatch.setattr(Peer, "call", dies_after_the_first)
    with pytest.raises(Unreachable):
        master.restore()
    monkeypatch.setattr(Peer, "call", original)
    assert ps[0].generation != ps[1].generation
    reborn = Master(SPEC, tmp_path)
    assert reborn.restoring and reborn.next_shard("w") == {"wait": 0.2}
    reborn.restore()  # what its serve loop does while ``restoring`` is set
    assert ps[0].generation == ps[1].generation == reborn.generation
    while not trained(reborn):
        train_shard(reborn, peers, "w", rng)
    assert counts(reborn.accounting()) == (1000, 0, 0)


def test_the_master_api_refuses_every_request_without_the_jobs_key(cluster):
    """Signed requests pass; unsigned, wrongly keyed, replayed and stale ones get 401 and change
    nothing; only the Prometheus text is open."""
    import json
    import threading
    import time
    import urllib.error
    import urllib.request

    from airflow_dlrover.runtime.auth import HEADER, call_master, sign
    from airflow_dlrover.runtime.master import http_server

    master, _, _ = cluster(1)
    server = http_server(master)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"

    def raw(path, body=None, header=None):
        data = None if body is None else json.dumps(body).encode()
        headers = {} if header is None else {HEADER: header}
        try:
            with urllib.request.urlopen(urllib.request.Request(base + path, data=data, headers=headers), timeout=5) as r:
                return r.status
        except urllib.error.HTTPError as err:
            return err.code

    try:
        body = {"worker": "forger", "shard": 0, "generation": master.generation}
        data = json.dumps(body).encode()
        good = sign(SPEC.key, "POST", "/shard/done", data)
        assert raw("/shard/done", body) == 401  # no signature
        assert raw("/shard/done", body, sign(b"not the key", "POST", "/shard/done", data)) == 401
        assert raw("/shard/done", body, sign(SPEC.key, "POST", "/shard/done", data, now=time.time() - 3600)) == 401
        assert raw("/shard/done", {**body, "shard": 1}, good) == 401  # the body was changed
        assert raw("/faults", {"faults": [{"kind": "kill-worker", "at_s": 0, "node": "worker-0"}]}, "t=1,n=2,s=3") == 401
        assert raw("/status") == 401 and raw("/accounting") == 401
        assert master.done == set() and master.faults == []
        assert raw("/shard/done", body, good) == 200 and master.done == {0}
        assert raw("/shard/done", body, good) == 401  # the same request again: a replay
        assert raw("/metrics/prometheus") == 200
        assert master.counters["requests_refused"] == 8
        assert call_master(base, "/status", timeout=5, key=SPEC.key)["shards"]["done"] == 1
        with pytest.raises(PermissionError, match="refused"):
            call_master(base, "/status", timeout=5, key=b"wrong")
    finally:
        server.shutdown()


def test_a_revoked_lease_whose_holder_finishes_anyway_costs_no_duplicate(cluster):
    """The demo's old 8,192 duplicated samples: w0's lease is revoked while w0 still trains the
    shard; w1 is handed it and trains it too; both report it done. Every batch is applied once."""
    master, _, peers = cluster(2)
    rng = np.random.default_rng(9)
    first = master.next_shard("w0")
    generation = first["generation"]
    peers[0].call("init_dense", generation=generation, params=np.zeros(3, np.float32))
    for offset in range(first["start"], first["start"] + 50, 25):  # w0 is half-way ...
        push(peers, generation, offset, "w0", rng)
    master.leases[first["shard"]].deadline = 0  # ... when its lease is revoked
    again = master.next_shard("w1")
    assert again["shard"] == first["shard"]
    for offset in range(again["start"], again["stop"], 25):  # w1 trains the whole shard
        push(peers, generation, offset, "w1", rng)
    for offset in range(first["start"] + 50, first["stop"], 25):  # w0 finishes its half anyway
        push(peers, generation, offset, "w0", rng)
    assert master.shard_done("w1", again["shard"], generation)["accepted"]
    assert master.shard_done("w0", first["shard"], generation)["accepted"]
    while not trained(master):
        train_shard(master, peers, "w1", rng)
    accounting = master.accounting()
    assert counts(accounting) == (1000, 0, 0)
    assert accounting["duplicates_refused"] == 2 * 100  # 4 batches, each refused once on each PS
    assert accounting["duplicates_refused_by"] == {"lease of w0 expired": 200}


def test_a_checkpoint_holds_no_second_copy_of_the_tables_and_a_restore_one_table_at_a_time(tmp_path):
    """The PS request's transient (``MemoryModel.ps_transient_mb``) is one table, not all: ``save``
    streams the rows it holds, ``restore`` reads one table of one file at a time."""
    import tracemalloc

    spec = JobSpec(job_id="mem", samples=1000, shard_size=100, batch_size=25, table_sizes=(40_000,) * 8,
                   embedding_dim=32, bottom_mlp=(8, 32), shard_timeout_s=60)
    ps = ParameterServer(spec, 0, 1)
    ps.generation = 0
    rng = np.random.default_rng(0)
    for table in ps.tables:
        ids = np.arange(40_000)
        table.apply_adagrad(ids, rng.standard_normal((len(ids), 32)).astype(np.float32), 0.1)
    tables = sum(t.rows[: t.used].nbytes + t.accumulator[: t.used].nbytes + t.ids[: t.used].nbytes for t in ps.tables)
    largest = max(t.rows[: t.used].nbytes + t.accumulator[: t.used].nbytes + t.ids[: t.used].nbytes for t in ps.tables)
    path = str(tmp_path / "ps-0.npz")
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        ps.save(path)
        saved = tracemalloc.get_traced_memory()[1] - base
        fresh = ParameterServer(spec, 0, 1)
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        fresh.restore([path], generation=1)
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert saved < 0.1 * tables  # chunks of the writer, no copy of ~21 MB of rows
    restored = after - before  # the tables it now holds (with the slack of their arrays' growth)
    print(f"restore transient {(peak - before - restored) / largest:.2f} × the largest table, save {saved / tables:.3f} × the tables")
    assert peak - before - restored <= 1.5 * largest < tables / 4  # the transient: about one table, not eight
    np.testing.assert_array_equal(fresh.tables[3].rows[: fresh.tables[3].used], ps.tables[3].rows[: ps.tables[3].used])


def test_the_largest_table_is_the_layouts_biggest_alone():
    from airflow_dlrover.runtime.layout import FeatureLayout

    layout = FeatureLayout.criteo(table_sizes=(100, 2000, 50), dim=8)
    assert layout.largest_table_mb() == pytest.approx(FeatureLayout.criteo(table_sizes=(2000,), dim=8).table_mb())
    assert layout.largest_table_mb() < layout.table_mb()


def test_a_checkpoint_fails_fast_on_a_dead_ps_and_leaves_the_master_to_its_relaunch(tmp_path):
    """A PS dead while a checkpoint is taken: the checkpoint fails within ``CHECKPOINT_PEER_RETRY_S``
    (it holds the master's lock meanwhile), so the relaunched PS is taken and restored at once."""
    servers = [Server(ParameterServer(SPEC, i, 2).handle, SPEC.key).start() for i in range(2)]
    address = [f"{s.address[0]}:{s.address[1]}" for s in servers]
    master = Master(SPEC, tmp_path)
    master.set_cluster(address)
    master.checkpoint()
    servers[1].close()
    started = time.monotonic()
    with pytest.raises(Unreachable):
        master.checkpoint()
    assert time.monotonic() - started < CHECKPOINT_PEER_RETRY_S + 1.0
    relaunched = Server(ParameterServer(SPEC, 1, 2).handle, SPEC.key).start()
    servers.append(relaunched)
    try:
        restored = master.set_cluster([address[0], f"{relaunched.address[0]}:{relaunched.address[1]}"])
        assert restored["checkpoint"] == 1 and master.status()["counters"]["checkpoints"] == 1
        assert time.monotonic() - started < CHECKPOINT_PEER_RETRY_S + 3.0
    finally:
        for server in servers:
            server.close()


def test_a_ps_writes_and_reads_only_inside_the_jobs_folder(tmp_path):
    """A key holder's checkpoint and journal paths must lie inside the job's folder: a save to, a
    restore from or a journal in another place — by an absolute path, ``..`` or a link — is
    refused naming the field, before any state changes; inside, each works."""
    from airflow_dlrover.optimizer.types import InvalidInputError

    job = tmp_path / "job"
    (job / "checkpoints").mkdir(parents=True)
    (job / "link").symlink_to(tmp_path)
    ps = ParameterServer(SPEC, 0, 1, job)
    ps.set_generation(0, journal=str(job / "journal"))
    inside = job / "checkpoints" / "ps-0.npz"
    ps.handle("save", generation=0, path=str(inside))
    refused = [(lambda p: ps.handle("save", generation=0, path=p), str(tmp_path / "elsewhere.npz"), "path"),
               (lambda p: ps.handle("save", generation=0, path=p), str(job / ".." / "up.npz"), "path"),
               (lambda p: ps.handle("save", generation=0, path=p), str(job / "link" / "linked.npz"), "path"),
               (lambda p: ps.restore([str(inside), p], 1), "/etc/passwd", "paths[1]"),
               (lambda p: ps.restore(p, 1), str(inside), "paths"),
               (lambda p: ps.set_generation(0, journal=p), str(tmp_path), "journal")]
    for call, path, field in refused:
        with pytest.raises(InvalidInputError) as err:
            call(path)
        assert err.value.field == field
        assert ("a list of checkpoint files" if field == "paths" else "inside the job's folder") in str(err.value)
    assert ps.generation == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["job"]
    assert ps.restore([str(inside)], 1)["generation"] == 1
