"""Request/reply transport between training processes: ``multiprocessing.connection`` over TCP.

Why not ``torch.distributed.rpc``: its group has a fixed world size at init, and elasticity (a
worker joining or leaving, a PS restarting) needs peers that come and go. A connection per client
and a thread per connection at the server does that with nothing to coordinate. Measured on this
machine (2 cores, loopback, TCP_NODELAY): ~7,700 small round trips/s from one client, against
~950/s for TensorPipe RPC (``torch.distributed.rpc``) on the same machine.

A request is ``(method, kwargs)``; the reply is ``("ok", result)`` or ``("error", message)``. A
message is one frame: pickle protocol 5 with its buffers out of band (PEP 574) — the pickle of the
structure, then each array's bytes as they lie in memory — so an array is neither copied into the
pickle nor out of it: the receiver's arrays are views of the frame it received. The PS
protocol sends every table's ids, and rows or gradients, as one array each way
(``ps.ParameterServer.lookup``): a push of the demo's batch (26 tables, 7,780 rows × 16 floats)
takes 0.12 ms to encode and decode as a frame against 0.24 ms as a protocol-4 pickle of one array
per table, on this 2-core machine (``python benchmarks/runtime.py transport``). Connections
authenticate with the job's key (the ``multiprocessing`` HMAC challenge, both ways) before anything
is unpickled. The server does the handshake in the connection's own thread, within
``HANDSHAKE_TIMEOUT_S``: a client with a wrong key, or one that connects and says nothing, costs
only its own thread, never the accept loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import socket
import threading
import time
import struct
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener, answer_challenge, deliver_challenge
from typing import Any, Callable

log = logging.getLogger(__name__)

#: A client must finish the key handshake within this long (a loopback or in-cluster round trip
#: takes milliseconds; a client that says nothing is dropped). (ours)
HANDSHAKE_TIMEOUT_S = 10.0


def _receive_timeout(conn: Connection, seconds: float) -> None:
    """``SO_RCVTIMEO`` on the connection's socket (0: none): a blocking read gives up after it."""
    sock = socket.fromfd(conn.fileno(), socket.AF_INET, socket.SOCK_STREAM)  # a dup: closing it is safe
    try:
        whole = int(seconds)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", whole, int((seconds - whole) * 1e6)))
    finally:
        sock.close()


def _no_delay(conn: Connection) -> Connection:
    """Disable Nagle's algorithm: ``Connection`` writes a length header and a payload in two
    sends, and Nagle + delayed ACK then stall every large reply by ~40 ms (measured: a lookup
    round trip took 44 ms with it, see the module docstring for the figure without)."""
    sock = socket.fromfd(conn.fileno(), socket.AF_INET, socket.SOCK_STREAM)  # a dup: closing it is safe
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    finally:
        sock.close()
    return conn


#: a frame's head: the number of out-of-band buffers, then each one's length, then the pickle's
_COUNT = struct.Struct("!I")


def encode(message: Any) -> list[Any]:
    """``message`` as a frame's parts (see the module docstring): the head, the pickle, then the
    raw bytes of each buffer the pickle left out of band."""
    buffers: list[pickle.PickleBuffer] = []
    body = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    lengths = struct.pack(f"!{len(raws) + 1}Q", *(r.nbytes for r in raws), len(body))
    head = _COUNT.pack(len(raws)) + lengths
    return [head, body, *raws]


def decode(frame: bytes | bytearray) -> Any:
    """The message of one frame; its arrays are views of ``frame``."""
    view = memoryview(frame)
    (count,) = _COUNT.unpack_from(view)
    lengths = struct.unpack_from(f"!{count + 1}Q", view, _COUNT.size)
    at = _COUNT.size + 8 * (count + 1)
    body, at = view[at:at + lengths[-1]], at + lengths[-1]
    buffers = []
    for length in lengths[:-1]:
        buffers.append(view[at:at + length])
        at += length
    return pickle.loads(body, buffers=buffers)


_LENGTH = struct.Struct("!Q")
#: at most this many parts go to one ``sendmsg`` (Linux's IOV_MAX is 1024)
_PARTS_PER_SEND = 512


class Channel:
    """A connection past its key handshake, carrying frames over its socket: each one's length
    (8 bytes), then the frame, sent without joining its parts (``sendmsg``) and received into one
    buffer of its size (``multiprocessing``'s own ``recv_bytes`` reallocates the rest of a large
    message on every read)."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.sock = socket.socket(fileno=os.dup(conn.fileno()))

    def send(self, message: Any) -> None:
        parts = [memoryview(p).cast("B") for p in encode(message)]
        pending = [memoryview(_LENGTH.pack(sum(p.nbytes for p in parts))), *parts]
        while pending:
            sent = self.sock.sendmsg(pending[:_PARTS_PER_SEND])
            while pending and sent >= pending[0].nbytes:
                sent -= pending.pop(0).nbytes
            if sent:
                pending[0] = pending[0][sent:]

    def receive(self) -> Any:
        head = bytearray(_LENGTH.size)
        self._fill(memoryview(head))
        frame = bytearray(_LENGTH.unpack(head)[0])
        self._fill(memoryview(frame))
        return decode(frame)

    def _fill(self, view: memoryview) -> None:
        got = 0
        while got < len(view):
            n = self.sock.recv_into(view[got:])
            if n == 0:
                raise EOFError("the peer closed the connection")
            got += n

    def close(self) -> None:
        self.sock.close()
        self.conn.close()


def parse_address(text: str) -> tuple[str, int]:
    """``"host:port"`` → ``(host, port)``."""
    host, port = text.rsplit(":", 1)
    return host, int(port)


def announce(ready_file, address: tuple[str, int]) -> None:
    """Write ``host:port`` to ``ready_file`` atomically: the launcher waits for it. A node that
    listens on every interface announces its host name."""
    host = socket.getfqdn() if address[0] in ("0.0.0.0", "") else address[0]
    ready_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = ready_file.with_suffix(".tmp")
    tmp.write_text(f"{host}:{address[1]}")
    os.replace(tmp, ready_file)


class RemoteError(RuntimeError):
    """The peer raised while serving a request."""


class Unreachable(ConnectionError):
    """The peer could not be reached within the retry budget."""


class Server:
    """Serves ``handler(method, **kwargs)`` on a TCP port, one thread per connection."""

    def __init__(self, handler: Callable[..., Any], authkey: bytes, host: str = "127.0.0.1", port: int = 0):
        self._handler = handler
        self._authkey = authkey
        self._listener = Listener((host, port), backlog=64)  # the handshake is ours, per connection
        self.address: tuple[str, int] = self._listener.address
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="server-accept", daemon=True)
        self._connections: set[Connection] = set()
        self._connections_lock = threading.Lock()

    def start(self) -> "Server":
        self._thread.start()
        return self

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn = self._listener.accept()
            except (OSError, EOFError):
                if self._closed.is_set():
                    return
                continue  # a client that hung up at once
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        with self._connections_lock:
            self._connections.add(conn)
        try:
            self._serve_connection(conn)
        finally:
            with self._connections_lock:
                self._connections.discard(conn)

    def _serve_connection(self, conn: Connection) -> None:
        with conn:
            try:
                _receive_timeout(conn, HANDSHAKE_TIMEOUT_S)
                deliver_challenge(conn, self._authkey)
                answer_challenge(conn, self._authkey)
                _receive_timeout(conn, 0)
                channel = Channel(_no_delay(conn))
            except AuthenticationError:
                log.warning("refused a connection that does not know the job's key")
                return
            except (OSError, EOFError):  # hung up or said nothing (a TCP readiness probe does that)
                return
            with contextlib.closing(channel):
                self._answer(channel)

    def _answer(self, channel: Channel) -> None:
        while True:
            try:
                method, kwargs = channel.receive()
            except (EOFError, OSError):
                return
            try:
                reply = ("ok", self._handler(method, **kwargs))
            except Exception as err:  # reported to the caller, the server keeps serving
                log.exception("request %s failed", method)
                reply = ("error", f"{type(err).__name__}: {err}")
            try:
                channel.send(reply)
            except (EOFError, OSError):
                return

    def close(self) -> None:
        """Stop accepting and hang up every connection, as the process's exit would."""
        self._closed.set()
        try:
            # Unblock accept(): connect once to ourselves.
            socket.create_connection(self.address, timeout=1).close()
        except OSError:
            pass
        self._listener.close()
        with self._connections_lock:
            connections = list(self._connections)
        for conn in connections:
            try:  # a shutdown of a duplicate descriptor ends the serving thread's blocking recv
                with socket.fromfd(conn.fileno(), socket.AF_INET, socket.SOCK_STREAM) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Peer:
    """A client connection that reconnects, so a restarted peer is picked up transparently.

    Requests on it are answered in the order they were sent (the server serves a connection in one
    thread). ``post`` sends one without waiting for its reply; the next ``call`` or ``wait`` reads
    every reply still due, in order, and raises the first error among them. A request whose reply
    was not read when the connection broke is sent again on the new one (callers make requests
    idempotent where a resend matters: a PS applies each batch once)."""

    def __init__(self, address: tuple[str, int], authkey: bytes, *, retry_s: float = 60.0):
        self.address = tuple(address)
        self._authkey = authkey
        self._retry_s = retry_s
        self._conn: Channel | None = None
        self._lock = threading.Lock()
        self._due: list[tuple[str, dict[str, Any]]] = []  # requests whose replies are not read yet
        self._unsent = 0  # how many of the last of them are not sent on the current connection

    def _connect(self, deadline: float) -> Channel:
        delay = 0.05
        while True:
            try:
                return Channel(_no_delay(Client(self.address, authkey=self._authkey)))
            except (OSError, EOFError) as err:
                if time.monotonic() + delay > deadline:
                    raise Unreachable(f"{self.address[0]}:{self.address[1]} unreachable: {err}") from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _drop(self) -> None:
        """Forget a broken connection: every request still due goes again on the next one."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._unsent = len(self._due)

    def post(self, method: str, **kwargs: Any) -> None:
        """Send a request now and read its reply at the next ``call`` or ``wait``."""
        with self._lock:
            self._due.append((method, kwargs))
            self._unsent += 1
            if self._conn is not None:
                try:
                    self._conn.send((method, kwargs))
                    self._unsent -= 1
                except (EOFError, OSError):
                    self._drop()

    def call(self, method: str, *, retry_s: float | None = None, **kwargs: Any) -> Any:
        """Send one request and wait for its reply (and for those of the requests posted before
        it); reconnect and resend once the peer is back, for ``retry_s`` (default: the peer's)
        before :class:`Unreachable`."""
        with self._lock:
            self._due.append((method, kwargs))
            self._unsent += 1
            return self._exchange(retry_s)

    def wait(self, retry_s: float | None = None) -> None:
        """Read the replies of every posted request; raise the first error among them."""
        with self._lock:
            if self._due:
                self._exchange(retry_s)

    def _exchange(self, retry_s: float | None) -> Any:
        """Send what is unsent, read every reply due, in order; the last one's result."""
        deadline = time.monotonic() + (self._retry_s if retry_s is None else retry_s)
        replies: list[tuple[str, str, Any]] = []
        while self._due:
            if self._conn is None:
                self._conn = self._connect(deadline)
            try:
                for message in self._due[len(self._due) - self._unsent:]:
                    self._conn.send(message)
                    self._unsent -= 1
                while self._due:
                    status, result = self._conn.receive()
                    replies.append((self._due.pop(0)[0], status, result))
            except (EOFError, OSError):
                self._drop()
                if time.monotonic() > deadline:
                    method = self._due[0][0]
                    self._due, self._unsent = [], 0
                    raise Unreachable(f"{self.address} went away during {method}") from None
        for method, status, result in replies:
            if status == "error":
                raise RemoteError(f"{method} on {self.address[0]}:{self.address[1]}: {result}")
        return replies[-1][2]

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            self._due, self._unsent = [], 0
