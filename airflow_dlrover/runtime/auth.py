"""Proof of the job's key on every request to the master's HTTP API.

A request carries ``X-DLRover-Signature: t=<unix time>,n=<nonce>,s=<hex>`` where

    s = HMAC-SHA256(key, method ‖ "\\n" ‖ path ‖ "\\n" ‖ t ‖ "\\n" ‖ n ‖ "\\n" ‖ body)

(the scheme of AWS SigV4 and Stripe webhooks, reduced to what one job needs). The master checks
it in constant time (``hmac.compare_digest``), refuses a time more than ``CLOCK_SKEW_S`` away
from its own, and remembers every nonce for that long so that a captured request cannot be
replayed. The PS connections prove the same key by ``multiprocessing``'s HMAC challenge (see
``transport``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from typing import Any

HEADER = "X-DLRover-Signature"
#: How far a request's time may be from the master's clock (nodes of one cluster run NTP; a
#: replay must come within this window, where the nonce cache refuses it). (ours)
CLOCK_SKEW_S = 60.0


class Refused(PermissionError):
    """The request does not prove that its sender knows the job's key."""


def _digest(key: bytes, method: str, path: str, stamp: str, nonce: str, body: bytes) -> str:
    message = f"{method}\n{path}\n{stamp}\n{nonce}\n".encode() + body
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def sign(key: bytes, method: str, path: str, body: bytes = b"", now: float | None = None) -> str:
    """The header value that proves ``key`` for this request."""
    stamp = f"{time.time() if now is None else now:.3f}"
    nonce = secrets.token_hex(12)
    return f"t={stamp},n={nonce},s={_digest(key, method, path, stamp, nonce, body)}"


class Verifier:
    """Checks signatures for one key; thread-safe."""

    def __init__(self, key: bytes, skew_s: float = CLOCK_SKEW_S):
        self._key, self._skew_s = key, skew_s
        self._seen: set[str] = set()
        self._arrivals: deque[tuple[float, str]] = deque()  # (arrival, nonce), oldest first
        self._lock = threading.Lock()

    def check(self, method: str, path: str, body: bytes, header: str | None, now: float | None = None) -> None:
        """Return when the request is signed with the key, fresh and new; raise ``Refused`` else."""
        now = time.time() if now is None else now
        if not header:
            raise Refused(f"no {HEADER} header")
        try:
            fields = dict(part.split("=", 1) for part in header.split(","))
            stamp, nonce, signature = fields["t"], fields["n"], fields["s"]
            moment = float(stamp)
        except (ValueError, KeyError):
            raise Refused(f"malformed {HEADER} header") from None
        if not hmac.compare_digest(signature, _digest(self._key, method, path, stamp, nonce, body)):
            raise Refused("signature does not match the job's key")
        if abs(now - moment) > self._skew_s:
            raise Refused(f"signed {now - moment:+.0f} s from the master's clock (allowed ±{self._skew_s:g} s)")
        with self._lock:
            while self._arrivals and now - self._arrivals[0][0] > 2 * self._skew_s:
                self._seen.discard(self._arrivals.popleft()[1])
            if nonce in self._seen:
                raise Refused("replayed request (nonce already used)")
            self._seen.add(nonce)
            self._arrivals.append((now, nonce))


def call_master(base_url: str, path: str, body: dict[str, Any] | None = None, *, timeout: float, key: bytes) -> Any:
    """One request to a job master's HTTP API (GET without ``body``, POST with it), signed with
    the job's ``key`` (``runtime.auth``) and retried until ``timeout`` while the master is
    unreachable; raises ``ConnectionError`` after that, ``PermissionError`` when refused."""
    url = f"{base_url.rstrip('/')}{path}"
    data = None if body is None else json.dumps(body).encode()
    method = "GET" if data is None else "POST"
    deadline = time.monotonic() + timeout
    while True:
        try:
            headers = {"Content-Type": "application/json", HEADER: sign(key, method, path, data or b"")}
            request = urllib.request.Request(url, data=data, headers=headers, method=method)
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                text = reply.read()
            return text.decode() if path.endswith("prometheus") else json.loads(text)
        except urllib.error.HTTPError as err:
            if err.code == 401:
                raise PermissionError(f"master at {url} refused the request: {err.read().decode(errors='replace')}") from None
            if time.monotonic() > deadline:
                raise ConnectionError(f"master at {url} answered {err.code}: {err.read().decode(errors='replace')}") from None
            time.sleep(0.2)
        except OSError as err:
            if time.monotonic() > deadline:
                raise ConnectionError(f"master unreachable at {url}: {err}") from None
            time.sleep(0.2)
