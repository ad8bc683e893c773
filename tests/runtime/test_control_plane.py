"""The master's HTTP API under clients nobody scripted: oversized, slow, many, replayed and
malformed requests, and inputs from a key holder checked like a user's; job ids and the job
folder's modes."""

import hashlib
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from airflow_dlrover import timings as T
from airflow_dlrover.optimizer.types import InvalidInputError
from airflow_dlrover.runtime import master as master_module
from airflow_dlrover.runtime.auth import HEADER, MasterRejected, call_master, sign, sign_hashed
from airflow_dlrover.runtime.master import Master, http_server
from airflow_dlrover.runtime.layout import FeatureLayout
from airflow_dlrover.runtime.ps import ParameterServer
from airflow_dlrover.runtime.spec import JobSpec

SPEC = JobSpec(job_id="plane", samples=10 * 100, shard_size=100, batch_size=25, table_sizes=(1000, 500),
               embedding_dim=4, bottom_mlp=(8, 4), shard_timeout_s=60)


def serve(master):
    """``master``'s HTTP API in a thread; returns (server, base URL)."""
    server = http_server(master)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def request(base, path, body=None, header="sign", key=SPEC.key, data=None):
    """(status, JSON reply) of one request; ``header``: "sign" signs it with ``key``, None sends none."""
    if data is None and body is not None:
        data = json.dumps(body).encode()
    method = "GET" if data is None else "POST"
    headers = {}
    if header == "sign":
        headers[HEADER] = sign(key, method, path, data or b"")
    elif header is not None:
        headers[HEADER] = header
    try:
        with urllib.request.urlopen(urllib.request.Request(base + path, data=data, headers=headers,
                                                           method=method), timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def first_line(address, raw: bytes, timeout=5.0) -> bytes:
    """The status line the server answers ``raw`` with (b"" when it closes without one)."""
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(raw)
        reply = b""
        while b"\r\n" not in reply:
            chunk = sock.recv(1024)
            if not chunk:
                break
            reply += chunk
        return reply.split(b"\r\n")[0]


@pytest.fixture()
def api(tmp_path):
    master = Master(SPEC, tmp_path)
    server, base = serve(master)
    yield master, server, base
    server.shutdown()
    server.server_close()


# -- A: the body is read only after the signed header -------------------------------------------

@pytest.mark.jobs
def test_a_400_mb_post_never_grows_the_masters_memory(tmp_path):
    """Content-Length is checked against the route's limit, and the signature against the header,
    before a byte of the body is read: a real master's RSS grows by < 64 MB under a streamed
    400 MB POST, unsigned or signed with the key, and it serves on."""
    import psutil

    from airflow_dlrover.runtime.transport import parse_address

    SPEC.save(tmp_path / "spec.json")
    with open(tmp_path / "master.log", "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "airflow_dlrover.runtime", "master", "--job-dir",
                                    str(tmp_path)], stdout=log, stderr=subprocess.STDOUT)
    try:
        ready = tmp_path / "run" / "master.addr"
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "master.log").read_text()
            time.sleep(0.05)
        address = parse_address(ready.read_text())
        rss = psutil.Process(process.pid).memory_info
        total, block = 400 << 20, b"x" * (1 << 20)
        streamed_hash = hashlib.sha256()
        for _ in range(total // len(block)):
            streamed_hash.update(block)
        signed = sign_hashed(SPEC.key, "POST", "/shard/done", total, streamed_hash.hexdigest())
        for header in (None, signed):
            baseline, peak, done = rss().rss, [0], threading.Event()

            def sample():
                while not done.is_set():
                    peak[0] = max(peak[0], rss().rss)
                    time.sleep(0.005)

            sampler = threading.Thread(target=sample)
            sampler.start()
            head = f"POST /shard/done HTTP/1.1\r\nHost: m\r\nContent-Length: {total}\r\n"
            head += "" if header is None else f"{HEADER}: {header}\r\n"
            sent = 0
            with socket.create_connection(address, timeout=30) as sock:
                try:
                    sock.sendall(f"{head}\r\n".encode())
                    while sent < total:
                        sock.sendall(block)
                        sent += len(block)
                except OSError:  # the master closed the connection
                    pass
            time.sleep(0.3)
            done.set()
            sampler.join()
            growth = (max(peak[0], rss().rss) - baseline) / 2**20
            assert growth < 64, f"RSS grew by {growth:.0f} MB (header {'signed' if header else 'none'})"
            assert sent < total  # refused, not read
        assert request(f"http://{address[0]}:{address[1]}", "/status")[0] == 200
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.unit
def test_a_body_over_the_routes_limit_is_refused_before_it_is_read(api):
    master, server, base = api
    address = server.server_address
    limit = master_module.BODY_LIMIT_BYTES
    line = first_line(address, f"POST /shard/done HTTP/1.0\r\nContent-Length: {limit + 1}\r\n\r\n".encode())
    assert line.startswith(b"HTTP/1.0 413")
    # the signed length is the body's: a header signed for a short body cannot carry a longer one
    body = json.dumps({"worker": "w", "shard": 0, "generation": 0}).encode()
    header = sign(SPEC.key, "POST", "/shard/done", body)
    assert request(base, "/shard/done", data=body + b" ", header=header)[0] == 401
    assert request(base, "/shard/done", data=body, header=header)[0] == 200 and master.done == {0}
    assert request(base, "/plan", {"reason": "r" * (limit * 2)})[0] == 200  # the plan's limit is larger


# -- B: slow and many clients -------------------------------------------------------------------

@pytest.mark.unit
def test_a_silent_connection_is_closed_after_the_read_timeout(tmp_path, monkeypatch):
    monkeypatch.setattr(master_module, "READ_TIMEOUT_S", 0.5, raising=False)
    server, _ = serve(Master(SPEC, tmp_path))
    try:
        with socket.create_connection(server.server_address, timeout=5) as sock:
            started = time.monotonic()
            sock.sendall(b"POST /shard/done HTTP/1.0\r\n")  # half a request, then nothing
            assert sock.recv(1024) == b""  # the master hung up
            assert time.monotonic() - started < 3
    finally:
        server.shutdown()


@pytest.mark.unit
def test_a_request_that_trickles_is_cut_at_its_deadline(tmp_path, monkeypatch):
    """A byte every 0.2 s never trips the read timeout; the request's deadline closes it."""
    monkeypatch.setattr(master_module, "READ_TIMEOUT_S", 5.0, raising=False)
    monkeypatch.setattr(master_module, "REQUEST_READ_S", 1.0, raising=False)
    server, _ = serve(Master(SPEC, tmp_path))
    try:
        with socket.create_connection(server.server_address, timeout=5) as sock:
            started = time.monotonic()
            with pytest.raises(OSError):
                for byte in b"POST /shard/done HTTP/1.0\r\nX-Padding: " + b"a" * 100:
                    sock.sendall(bytes([byte]))
                    time.sleep(0.2)
                    assert time.monotonic() - started < 4, "the trickling request was never cut"
    finally:
        server.shutdown()


@pytest.mark.unit
@pytest.mark.parametrize("length", ["-1", "abc", "1e3", ""])
def test_a_negative_or_garbled_content_length_answers_400_at_once(api, length):
    _, server, _ = api
    started = time.monotonic()
    line = first_line(server.server_address, f"POST /shard/done HTTP/1.0\r\nContent-Length: {length}\r\n\r\n".encode())
    assert line.startswith(b"HTTP/1.0 400") and time.monotonic() - started < 2


@pytest.mark.unit
def test_connections_beyond_the_bound_are_turned_away_without_a_thread(tmp_path, monkeypatch):
    monkeypatch.setattr(master_module, "MAX_CONNECTIONS", 8, raising=False)
    server, base = serve(Master(SPEC, tmp_path))
    idle = []
    try:
        before = threading.active_count()
        for _ in range(60):  # connect and say nothing
            idle.append(socket.create_connection(server.server_address, timeout=5))
        time.sleep(0.5)
        assert threading.active_count() <= before + 8
        extra = first_line(server.server_address, b"GET /healthz HTTP/1.0\r\n\r\n")
        assert extra.startswith(b"HTTP/1.0 503")
        for sock in idle:
            sock.close()
        idle.clear()
        assert call_master(base, "/status", timeout=10, key=SPEC.key)["shards"]["done"] == 0  # slots free again
    finally:
        for sock in idle:
            sock.close()
        server.shutdown()


# -- D: replays across a restart ----------------------------------------------------------------

@pytest.mark.unit
def test_a_signed_request_is_refused_after_a_master_restart(tmp_path):
    body = json.dumps({"node": "worker-0", "command": "kill"}).encode()
    header = sign(SPEC.key, "POST", "/command", body)
    server, base = serve(Master(SPEC, tmp_path))
    try:
        assert request(base, "/command", data=body, header=header)[0] == 200
    finally:
        server.shutdown()
        server.server_close()
    reborn = Master(SPEC, tmp_path)  # a new process over the same folder
    server, base = serve(reborn)
    try:
        status, reply = request(base, "/command", data=body, header=header)
        assert status == 401 and "replayed" in reply["error"]
        assert reborn.commands == {}
        assert stat.S_IMODE(os.stat(tmp_path / master_module.NONCES_FILE).st_mode) == 0o600
    finally:
        server.shutdown()


@pytest.mark.unit
def test_the_nonce_file_keeps_the_window_and_stays_small(tmp_path, monkeypatch):
    """Rewritten with only the live nonces once it grows past them by ``NONCE_COMPACT_LINES``;
    a nonce older than twice the clock window is forgotten at the next start."""
    from airflow_dlrover.runtime import auth
    from airflow_dlrover.runtime.auth import Refused, Verifier

    monkeypatch.setattr(auth, "NONCE_COMPACT_LINES", 5)
    path, now = tmp_path / "nonces.txt", time.time()
    verifier = Verifier(SPEC.key, nonce_file=path)
    old = sign(SPEC.key, "GET", "/status", now=now - 200)
    verifier.check("GET", "/status", b"", old, now=now - 200)
    headers = [sign(SPEC.key, "GET", "/status") for _ in range(20)]
    for header in headers:
        verifier.check("GET", "/status", b"", header)
    assert len(path.read_text().splitlines()) <= 21 + 5
    verifier.close()
    again = Verifier(SPEC.key, nonce_file=path)
    for header in headers:
        with pytest.raises(Refused, match="replayed"):
            again.check("GET", "/status", b"", header)
    assert old.split(",")[1][2:] not in path.read_text()  # past the window: forgotten


@pytest.mark.unit
def test_a_refusal_never_tells_the_masters_clock(api):
    _, _, base = api
    body = json.dumps({"node": "worker-0", "command": "kill"}).encode()
    for offset in (-3600, 3600, 61):
        status, reply = request(base, "/command", data=body,
                                header=sign(SPEC.key, "POST", "/command", body, now=time.time() + offset))
        assert status == 401 and str(offset) not in reply["error"] and "clock" in reply["error"]
        assert not any(ch.isdigit() for ch in reply["error"].split("allowed")[0])


@pytest.mark.unit
@pytest.mark.parametrize("skew_s", [-3600.0, 61.0, 75.0])
def test_a_caller_whose_clock_is_off_learns_the_masters_and_is_answered(api, monkeypatch, skew_s):
    """A node whose clock is off by more than the window is refused once, learns the master's
    clock from the refusal's Date header, and is answered — no crash loop; the offset it keeps
    signs its next requests right away."""
    from airflow_dlrover.runtime import auth

    master, _, base = api
    monkeypatch.setattr(auth, "_offsets", {base: skew_s})  # as a client whose clock runs skew_s ahead
    assert call_master(base, "/status", timeout=5.0, key=SPEC.key)["state"] == "training"
    assert abs(auth._offsets.get(base, 0.0)) <= auth.CLOCK_OFFSET_MIN_S  # it signs on the master's clock now
    assert master.counters["requests_refused"] == 1
    assert call_master(base, "/status", timeout=5.0, key=SPEC.key)["job_id"] == SPEC.job_id
    assert master.counters["requests_refused"] == 1  # the next request needed no second try
    with pytest.raises(PermissionError):  # a wrong key is refused still, after one retry at most
        call_master(base, "/status", timeout=5.0, key=b"not the key")


@pytest.mark.unit
@pytest.mark.parametrize("path, body, code", [("/command", {"node": "worker-0", "command": "explode"}, 400),
                                              ("/no-such-route", {}, 404)])
def test_a_request_the_master_rejects_is_not_sent_again(api, path, body, code):
    """A 4xx other than 401 (a bad field, no such route) raises at once, naming the code and the
    master's reason: sending it again until the timeout cannot help, and it is no unreachable master."""
    master, _, base = api
    started = time.monotonic()
    with pytest.raises(MasterRejected) as rejected:
        call_master(base, path, body, timeout=10.0, key=SPEC.key)
    assert time.monotonic() - started < 2.0 and rejected.value.code == code and str(code) in str(rejected.value)
    assert not isinstance(rejected.value, ConnectionError)


# -- E: a key holder's inputs --------------------------------------------------------------------

@pytest.mark.unit
@pytest.mark.parametrize("path, body, field", [
    ("/shard/done", {"worker": "w", "shard": "x", "generation": 0}, "shard"),
    ("/shard/done", {"worker": "w", "shard": -1, "generation": 0}, "shard"),
    ("/shard/done", {"worker": "w", "shard": 10, "generation": 0}, "shard"),
    ("/shard/done", {"worker": "w", "shard": True, "generation": 0}, "shard"),
    ("/shard/done", {"worker": "w", "shard": 0, "generation": "0"}, "generation"),
    ("/shard/done", {"worker": "w", "shard": 0, "generation": 0, "bad_rows": -5}, "bad_rows"),
    ("/shard/done", {"worker": ["w"], "shard": 0, "generation": 0}, "worker"),
    ("/shard/next", {"worker": "", "generation": 0}, "worker"),
    ("/shard/abandon", {"worker": "w", "shard": -2}, "shard"),
    ("/report", {"node": "w", "role": "worker", "samples_per_s": "fast"}, "samples_per_s"),
    ("/report", {"node": "w", "role": "worker", "rss_mb": float("nan")}, "rss_mb"),
    ("/command", {"node": "worker-0", "command": "rm -rf /"}, "command"),
    ("/faults", {"faults": [{"kind": "kill-worker", "at_s": 0}]}, "faults[0]"),
    ("/faults", {"faults": [{"kind": "kill-worker", "at_s": "soon", "node": "w"}]}, "faults[0].at_s"),
    ("/faults", {"faults": [{"kind": "melt-cpu", "at_s": 0, "node": "w"}]}, "faults[0].kind"),
    ("/cluster", {"ps": ["no port"]}, "ps"),
    ("/checkpoint", {"hold": "yes"}, "hold"),
    ("/report_interval", {"seconds": 0}, "seconds"),
    ("/report_interval", {"seconds": 3600}, "seconds"),
    ("/report_interval", {"seconds": "often"}, "seconds"),
    ("/report_interval", {"seconds": True}, "seconds"),
])
def test_a_key_holders_bad_input_answers_400_naming_the_field_and_persists_nothing(api, tmp_path, path, body, field):
    master, _, base = api
    before = (tmp_path / "master_state.json").read_text()
    status, reply = request(base, path, body)
    assert status == 400 and reply["error"].startswith(f"{field}=") and "allowed" in reply["error"]
    assert (tmp_path / "master_state.json").read_text() == before
    status, reply = request(base, "/status")
    assert status == 200 and reply["shards"] == {"todo": 10, "doing": 0, "done": 0}
    assert master.commands == {} and master.latest == {} and master.faults == []
    assert master.report_interval_s == T.REPORT_INTERVAL_S


@pytest.mark.unit
def test_the_report_interval_set_by_a_key_holder_reaches_the_workers_and_a_restart_forgets_it(api, tmp_path):
    master, _, base = api
    report = {"node": "worker-0", "role": "worker", "samples": 0}
    assert request(base, "/report", report)[1]["report_interval_s"] == T.REPORT_INTERVAL_S
    assert request(base, "/report_interval", {"seconds": 0.25}, header=None)[0] == 401
    assert request(base, "/report_interval", {"seconds": 0.25}, key=b"another job's key")[0] == 401
    assert request(base, "/report", report)[1]["report_interval_s"] == T.REPORT_INTERVAL_S
    assert request(base, "/report_interval", {"seconds": 0.25}) == (200, {"report_interval_s": 0.25})
    assert request(base, "/report", report)[1]["report_interval_s"] == 0.25
    assert Master(SPEC, tmp_path).report(**report)["report_interval_s"] == T.REPORT_INTERVAL_S


@pytest.mark.unit
def test_the_finish_task_is_never_marked_done_by_a_shard_report(api):
    master, _, base = api
    assert request(base, "/shard/done", {"worker": "w", "shard": master_module.FINISH, "generation": 0})[0] == 400
    assert master_module.FINISH not in master.done
    assert request(base, "/shard/done", {"worker": "w", "shard": 9, "generation": 0})[0] == 200
    assert request(base, "/shard/abandon", {"worker": "w", "shard": master_module.FINISH})[0] == 200  # allowed
    assert request(base, "/shard/done", data=b"[1, 2]")[0] == 400  # not an object


@pytest.mark.unit
@pytest.mark.parametrize("table, ids, field", [
    (0, [-4], "ids[0]"),  # would index the row of id 998 (its local id -4 // 2 wraps around)
    (0, [1000], "ids[0]"),  # past the table
    (1, [3], "ids[1]"),  # owned by the other PS
])
def test_the_ps_refuses_ids_outside_its_tables(table, ids, field):
    ps = ParameterServer(SPEC, 0, 2)
    ps.set_generation(0)
    owned = [np.array([998], np.int64), np.array([498], np.int64)]
    before = [r.copy() for r in ps.lookup(owned)["rows"]]
    bad = [np.zeros(0, np.int64), np.zeros(0, np.int64)]
    bad[table] = np.array(ids, np.int64)
    grads = [np.ones((len(i), SPEC.embedding_dim), np.float32) for i in bad]
    with pytest.raises(InvalidInputError) as err:
        ps.handle("push", generation=0, ids=bad, grads=grads, batch=0, samples=25, worker="w")
    assert err.value.field == field
    with pytest.raises(InvalidInputError):
        ps.handle("lookup", generation=0, ids=bad)
    assert all(np.array_equal(a, b) for a, b in zip(ps.lookup(owned)["rows"], before))
    assert ps.batches == set()


@pytest.mark.unit
def test_the_ps_refuses_a_push_of_the_wrong_shape_or_batch():
    ps = ParameterServer(SPEC, 0, 1)
    ps.set_generation(0)
    ids = [np.array([1, 2], np.int64), np.zeros(0, np.int64)]
    grads = [np.ones((2, SPEC.embedding_dim), np.float32), np.zeros((0, SPEC.embedding_dim), np.float32)]
    cases = [({"grads": [np.ones((1, SPEC.embedding_dim), np.float32), grads[1]]}, "grads[0]"),  # would broadcast
             ({"batch": 7}, "batch"), ({"batch": -25}, "batch"), ({"batch": "0"}, "batch"),
             ({"samples": 0}, "samples"), ({"samples": 26}, "samples"),
             ({"ids": [np.array([1.5, 2.0]), ids[1]]}, "ids[0]"), ({"ids": ids[:1]}, "ids")]
    for change, field in cases:
        push = {"ids": ids, "grads": grads, "batch": 0, "samples": 25, "worker": "w", **change}
        with pytest.raises(InvalidInputError) as err:
            ps.handle("push", generation=0, **push)
        assert err.value.field == field
    assert ps.batches == set()
    assert ps.handle("push", generation=0, ids=ids, grads=grads, batch=25, samples=25, worker="w") is True


@pytest.mark.unit
def test_ids_and_gradients_in_one_array_give_the_rows_and_updates_of_one_array_per_table():
    """``lengths``: every table's ids in one array (and the rows and gradients likewise) — the same
    rows, the same update, the same refusals as the list of per-table arrays."""
    lists, packed = ParameterServer(SPEC, 0, 1), ParameterServer(SPEC, 0, 1)
    for ps in (lists, packed):
        ps.set_generation(0)
    ids = [np.array([3, 999, 7], np.int64), np.array([0, 499], np.int64)]
    flat, lengths = np.concatenate(ids), [3, 2]
    grads = [np.full((3, SPEC.embedding_dim), 0.5, np.float32), np.full((2, SPEC.embedding_dim), -1.0, np.float32)]
    assert np.array_equal(np.concatenate(lists.lookup(ids)["rows"]), packed.lookup(flat, lengths=lengths)["rows"])
    assert lists.push(ids, grads, batch=0, samples=25, worker="w")
    assert packed.push(flat, np.concatenate(grads), batch=0, samples=25, worker="w", lengths=lengths)
    assert np.array_equal(np.concatenate(lists.lookup(ids)["rows"]), packed.lookup(flat, lengths=lengths)["rows"])
    assert not packed.push(flat, np.concatenate(grads), batch=0, samples=25, worker="w", lengths=lengths)  # once
    cases = [({"lengths": [3, 1]}, "ids"),  # 4 ids counted for 5
             ({"lengths": [5]}, "lengths"),  # one count for two tables
             ({"ids": np.array([3, 999, 7, 0, 500])}, "ids[1]"),  # past table 1
             ({"grads": np.ones((4, SPEC.embedding_dim), np.float32)}, "grads")]
    for change, field in cases:
        push = {"ids": flat, "grads": np.concatenate(grads), "batch": 25, "samples": 25, "worker": "w",
                "lengths": lengths, **change}
        with pytest.raises(InvalidInputError) as err:
            packed.handle("push", generation=0, **push)
        assert err.value.field == field
    assert packed.batches == {0}
    layout = FeatureLayout.from_dict({"label": "y", "dense": [{"name": "x"}], "sparse": [
        {"name": "a", "table_size": 10, "dim": 4}, {"name": "b", "table_size": 10, "dim": 8}]})
    two_dims = ParameterServer(JobSpec(job_id="dims", samples=1000, layout=layout, model="users.model:build"), 0, 1)
    two_dims.set_generation(0)
    with pytest.raises(InvalidInputError) as err:
        two_dims.lookup(np.array([1, 2]), lengths=[1, 1])
    assert err.value.field == "lengths"
    assert [r.shape for r in two_dims.lookup([np.array([1]), np.array([2])])["rows"]] == [(1, 4), (1, 8)]


# -- G: job ids and the job's settings ------------------------------------------------------------

@pytest.mark.unit
@pytest.mark.parametrize("job_id", ["../../x", "a/b", "..", ".hidden", "", "a" * 64, "x y", None, "-x"])
def test_a_job_id_that_is_no_safe_folder_name_is_refused(tmp_path, job_id):
    from airflow_dlrover.launchers.local import LocalLauncher

    with pytest.raises(InvalidInputError) as err:
        JobSpec(job_id=job_id)
    assert err.value.field == "job_id"
    with pytest.raises(InvalidInputError):
        LocalLauncher(tmp_path / "jobs").job_dir(job_id)


@pytest.mark.unit
def test_train_refuses_a_job_id_outside_out_before_writing_anything(tmp_path, capsys):
    from airflow_dlrover.cli import main

    out = tmp_path / "deep" / "out"
    assert main(["train", "--job-id", "../../x", "--out", str(out), "--samples", "1000"]) == 2
    assert "job_id='../../x' is invalid" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "deep" / "x").exists()


@pytest.mark.unit
@pytest.mark.parametrize("field", ["checkpoint_interval_s", "shard_timeout_s"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0.0, -1.0])
def test_the_jobs_intervals_are_finite_and_positive(field, value):
    with pytest.raises(InvalidInputError) as err:
        JobSpec(job_id="j", **{field: value})
    assert err.value.field == field and "finite number > 0" in str(err.value)


@pytest.mark.unit
def test_train_refuses_a_nan_checkpoint_interval(tmp_path, capsys):
    from airflow_dlrover.cli import main

    assert main(["train", "--checkpoint-interval", "nan", "--out", str(tmp_path), "--samples", "1000"]) == 2
    assert "checkpoint_interval_s=nan is invalid" in capsys.readouterr().err


# -- H: the job's folder is its user's ------------------------------------------------------------

@pytest.mark.jobs
def test_a_jobs_folder_and_files_are_readable_by_its_user_only(tmp_path):
    """Under a permissive umask the job folder is 0700 and every file in it 0600: checkpoints,
    journals, logs, the master's state."""
    from airflow_dlrover.launchers.local import LocalLauncher
    from airflow_dlrover.optimizer.types import Configuration

    config = Configuration(workers=1, ps=1, worker_cpu=1.0, ps_cpu=0.5, worker_memory_mb=2048, ps_memory_mb=1024)
    job = JobSpec(job_id="private", samples=10_000_000, checkpoint_interval_s=0.5)
    old = os.umask(0o022)
    try:
        launcher = LocalLauncher(tmp_path / "jobs")
        launcher.launch(job, config)
    finally:
        os.umask(old)
    folder = tmp_path / "jobs" / "private"
    try:
        deadline = time.monotonic() + 120
        while not (launcher.master_call("private", "/status")["checkpoint"] and list(folder.glob("journal/*.jsonl"))):
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.2)
    finally:
        launcher.stop("private")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    paths = list(folder.rglob("*"))
    names = {p.relative_to(folder).parts[0] for p in paths}
    assert {"checkpoints", "journal", "logs", "master_state.json", "spec.json", "job.json"} <= names
    loose = {str(p.relative_to(folder)): oct(stat.S_IMODE(p.stat().st_mode)) for p in paths
             if stat.S_IMODE(p.stat().st_mode) & 0o077}
    assert loose == {}


@pytest.mark.unit
def test_a_node_that_gives_up_on_an_unreachable_master_exits_with_the_clusters_code(tmp_path, monkeypatch):
    """Not 1, like a crash: the controller takes the same code again before any progress for a
    crash loop and fails the job for good, while a master that is down is the cluster's failure."""
    from airflow_dlrover.optimizer import constants as C
    from airflow_dlrover.runtime import __main__ as node
    from airflow_dlrover.runtime.transport import Unreachable

    SPEC.save(tmp_path / "spec.json")

    def gives_up(args, spec, ready):
        raise Unreachable("master unreachable at http://127.0.0.1:9/shard/next: [Errno 111] Connection refused")

    monkeypatch.setattr(node, "_run", gives_up)
    assert node.main(["worker", "--job-dir", str(tmp_path), "--master", "127.0.0.1:9"]) == C.UNREACHABLE_EXIT_CODE
