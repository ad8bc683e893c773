"""Proof of the job's key on every request to the master's HTTP API.

A request carries ``X-DLRover-Signature: t=<unix time>,n=<nonce>,l=<length>,h=<sha256>,s=<hex>`` where
``l`` and ``h`` are the body's length and SHA-256 (hex) and

    s = HMAC-SHA256(key, method ‖ "\\n" ‖ path ‖ "\\n" ‖ t ‖ "\\n" ‖ n ‖ "\\n" ‖ l ‖ "\\n" ‖ h)

(the scheme of AWS SigV4 and Stripe webhooks, reduced to what one job needs). The header alone
proves the key, so the master checks it *before* it reads a byte of the body
(:meth:`Verifier.check_header`), then reads exactly ``l`` bytes and compares their hash
(:meth:`Verifier.check_body`): a caller without the key never makes the master read or hold its
body. The master compares in constant time (``hmac.compare_digest``), refuses a time more than
``CLOCK_SKEW_S`` away from its own, and remembers every nonce for twice that long so that a
captured request cannot be replayed; with a ``nonce_file`` the nonces also outlive a restart of
the master (one line per nonce, appended and synced before the request is served, loaded at
start). A refusal tells the caller what failed, never the master's clock. A caller signs on the
master's clock as it last saw it — each reply's ``Date`` header (RFC 9110 §6.6.1, one-second
resolution), which every HTTP server sends — so that a node whose clock is off is refused once,
learns the offset and is answered, never stopped (:func:`call_master`). The PS connections
prove the same key by ``multiprocessing``'s HMAC challenge (see ``transport``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, NamedTuple

HEADER = "X-DLRover-Signature"
#: How far a request's time may be from the master's clock (nodes of one cluster run NTP; a
#: replay must come within this window, where the nonce cache refuses it). (ours)
CLOCK_SKEW_S = 60.0
#: A master's clock seen this far from ours (its replies' ``Date``) is what a caller signs on; less
#: is the ``Date`` header's own resolution and the request's time in flight. (ours)
CLOCK_OFFSET_MIN_S = 2.0
#: each master's clock minus ours, as its replies last showed it (seconds; by base URL)
_offsets: dict[str, float] = {}
#: The nonce file is rewritten with only the nonces still in the window once it holds this many
#: lines more than that (~40 bytes a line: a few hundred KB at most). (ours)
NONCE_COMPACT_LINES = 10_000
_FIELDS = {"t": re.compile(r"[0-9]{1,12}(\.[0-9]{1,6})?"), "n": re.compile(r"[0-9a-f]{16,64}"),
           "l": re.compile(r"[0-9]{1,15}"), "h": re.compile(r"[0-9a-f]{64}"), "s": re.compile(r"[0-9a-f]{64}")}


#: Answers a caller sends again until its timeout (the master busy, restarting or failing for a
#: moment): 408, 429 and the 5xx. Any other 4xx but 401 says the request itself is wrong.
RETRIED_STATUSES = frozenset({408, 429, *range(500, 600)})


class MasterRejected(ValueError):
    """The master answered the request 4xx (not 401, 408 or 429): sending it again cannot help."""

    def __init__(self, url: str, code: int, text: str):
        super().__init__(f"master at {url} answered {code}: {text}")
        self.code = code


class Refused(PermissionError):
    """The request does not prove that its sender knows the job's key. ``str()`` is what the
    caller is told; ``detail`` adds what only the master's log may say."""

    def __init__(self, message: str, detail: str = ""):
        super().__init__(message)
        self.detail = detail


def _digest(key: bytes, method: str, path: str, stamp: str, nonce: str, length: int, body_hash: str) -> str:
    message = f"{method}\n{path}\n{stamp}\n{nonce}\n{length}\n{body_hash}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def sign(key: bytes, method: str, path: str, body: bytes = b"", now: float | None = None) -> str:
    """The header value that proves ``key`` for this request."""
    return sign_hashed(key, method, path, len(body), hashlib.sha256(body).hexdigest(), now)


def sign_hashed(key: bytes, method: str, path: str, length: int, body_hash: str, now: float | None = None) -> str:
    """:func:`sign` for a body known by its length and SHA-256 (hex) only (a streamed one)."""
    stamp = f"{time.time() if now is None else now:.3f}"
    nonce = secrets.token_hex(12)
    signature = _digest(key, method, path, stamp, nonce, length, body_hash)
    return f"t={stamp},n={nonce},l={length},h={body_hash},s={signature}"


class Signed(NamedTuple):
    """What a request's header signed, for :meth:`Verifier.check_body`."""

    nonce: str
    body_hash: str
    now: float


class Verifier:
    """Checks signatures for one key; thread-safe. ``nonce_file``: where the nonces seen are kept
    across restarts (see the module docstring); None keeps them in memory only."""

    def __init__(self, key: bytes, skew_s: float = CLOCK_SKEW_S, nonce_file: str | Path | None = None):
        self._key, self._skew_s = key, skew_s
        self._seen: set[str] = set()
        self._arrivals: deque[tuple[float, str]] = deque()  # (arrival, nonce), oldest first
        self._lock = threading.Lock()
        self._file = None if nonce_file is None else Path(nonce_file)
        self._fd: int | None = None
        self._lines = 0
        if self._file is not None:
            self._load()

    # -- the nonces ----------------------------------------------------------------------------
    def _load(self) -> None:
        """The nonces of the file still in the window; the file is rewritten with only those (a
        torn last line of a master killed mid-write is dropped)."""
        now = time.time()
        if self._file.exists():
            for line in self._file.read_text(errors="replace").splitlines():
                arrival, _, nonce = line.partition(" ")
                try:
                    moment = float(arrival)
                except ValueError:
                    continue
                if now - moment <= 2 * self._skew_s and _FIELDS["n"].fullmatch(nonce) and nonce not in self._seen:
                    self._seen.add(nonce)
                    self._arrivals.append((moment, nonce))
        self._rewrite()

    def _rewrite(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        tmp = self._file.with_name(f".{self._file.name}.tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.writelines(f"{moment:.3f} {nonce}\n" for moment, nonce in self._arrivals)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._file)
        self._fd = os.open(self._file, os.O_WRONLY | os.O_APPEND)
        self._lines = len(self._arrivals)

    def _remember(self, now: float, nonce: str) -> None:
        """Record ``nonce`` (the caller holds the lock): in memory, and synced to the file before
        the request is served."""
        self._seen.add(nonce)
        self._arrivals.append((now, nonce))
        if self._fd is None:
            return
        if self._lines > len(self._arrivals) + NONCE_COMPACT_LINES:
            self._rewrite()
            return
        os.write(self._fd, f"{now:.3f} {nonce}\n".encode())
        os.fsync(self._fd)
        self._lines += 1

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    # -- the checks ----------------------------------------------------------------------------
    def check_header(self, method: str, path: str, header: str | None, length: int,
                     now: float | None = None) -> "Signed":
        """Check what the header alone proves: the key, the body's ``length`` (the request's
        Content-Length), the time and a nonce not seen yet; returns what :meth:`check_body`
        checks the body against. Raises ``Refused``."""
        now = time.time() if now is None else now
        if not header:
            raise Refused(f"no {HEADER} header")
        try:
            fields = dict(part.split("=", 1) for part in header.split(","))
            if set(fields) != set(_FIELDS) or not all(_FIELDS[k].fullmatch(v) for k, v in fields.items()):
                raise ValueError
        except ValueError:
            raise Refused(f"malformed {HEADER} header: allowed t=<time>,n=<nonce>,l=<length>,h=<sha256>,"
                          "s=<hmac>") from None
        stamp, nonce, signature = fields["t"], fields["n"], fields["s"]
        expected = _digest(self._key, method, path, stamp, nonce, int(fields["l"]), fields["h"])
        if not hmac.compare_digest(signature, expected):
            raise Refused("signature does not match the job's key")
        if int(fields["l"]) != length:
            raise Refused("the body's length is not the signed one")
        if abs(now - float(stamp)) > self._skew_s:
            raise Refused(f"signed too far from the master's clock (allowed ±{self._skew_s:g} s)",
                          f"{now - float(stamp):+.0f} s")
        with self._lock:
            if nonce in self._seen:
                raise Refused("replayed request (nonce already used)")
        return Signed(nonce, fields["h"], now)

    def check_body(self, body: bytes, signed: "Signed") -> None:
        """Raise ``Refused`` unless ``body`` is the one the header signed; then spend the nonce
        (once: of two copies of a request read at the same time, the second is refused)."""
        if not hmac.compare_digest(hashlib.sha256(body).hexdigest(), signed.body_hash):
            raise Refused("the body is not the signed one")
        with self._lock:
            while self._arrivals and signed.now - self._arrivals[0][0] > 2 * self._skew_s:
                self._seen.discard(self._arrivals.popleft()[1])
            if signed.nonce in self._seen:
                raise Refused("replayed request (nonce already used)")
            self._remember(signed.now, signed.nonce)

    def check(self, method: str, path: str, body: bytes, header: str | None, now: float | None = None) -> None:
        """Return when the request is signed with the key, fresh and new; raise ``Refused`` else."""
        self.check_body(body, self.check_header(method, path, header, len(body), now))


def call_master(base_url: str, path: str, body: dict[str, Any] | None = None, *, timeout: float, key: bytes) -> Any:
    """One request to a job master's HTTP API (GET without ``body``, POST with it), signed with
    the job's ``key`` on the master's clock as last seen (``_offsets``) and retried until
    ``timeout`` while the master is unreachable or answers one of ``RETRIED_STATUSES``; raises
    ``ConnectionError`` after that, ``PermissionError`` when refused — after one retry on a clock
    learnt from the refusal — and :class:`MasterRejected` at once for another 4xx."""
    url = f"{base_url.rstrip('/')}{path}"
    data = None if body is None else json.dumps(body).encode()
    method = "GET" if data is None else "POST"
    deadline = time.monotonic() + timeout
    relearnt = False
    while True:
        try:
            now = time.time() + _offsets.get(base_url, 0.0)
            headers = {"Content-Type": "application/json", HEADER: sign(key, method, path, data or b"", now=now)}
            request = urllib.request.Request(url, data=data, headers=headers, method=method)
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                text = reply.read()
                _learn_clock(base_url, reply.headers)
            return text.decode() if path.endswith("prometheus") else json.loads(text)
        except urllib.error.HTTPError as err:
            if err.code == 401:
                if not relearnt and _learn_clock(base_url, err.headers):
                    relearnt = True  # signed on a clock that was off: once more, on the master's
                    continue
                raise PermissionError(f"master at {url} refused the request: {err.read().decode(errors='replace')}") from None
            if err.code not in RETRIED_STATUSES:
                raise MasterRejected(url, err.code, err.read().decode(errors="replace")) from None
            if time.monotonic() > deadline:
                raise ConnectionError(f"master at {url} answered {err.code}: {err.read().decode(errors='replace')}") from None
            time.sleep(0.2)
        except OSError as err:
            if time.monotonic() > deadline:
                raise ConnectionError(f"master unreachable at {url}: {err}") from None
            time.sleep(0.2)


def _learn_clock(base_url: str, headers: Any) -> bool:
    """Keep the master's clock offset its reply's ``Date`` shows; True when it changed by more than
    ``CLOCK_OFFSET_MIN_S`` (a request signed on the old one may have been refused for it)."""
    try:
        seen = parsedate_to_datetime(headers.get("Date")).timestamp() + 0.5 - time.time()  # mid-second
    except (TypeError, ValueError, AttributeError):
        return False
    if abs(seen - _offsets.get(base_url, 0.0)) <= CLOCK_OFFSET_MIN_S:
        return False
    _offsets[base_url] = seen if abs(seen) > CLOCK_OFFSET_MIN_S else 0.0
    return True
